-- Store messages all-or-nothing; a duplicate id stores nothing and returns that id.
-- KEYS: 1 ready zset, 2 payload hash, 3 by-due zset, 4 due-time hash
-- ARGV: id1, payload1, due1, id2, payload2, due2, ...
for i = 1, #ARGV, 3 do
    if redis.call('HEXISTS', KEYS[2], ARGV[i]) == 1 then
        return ARGV[i]
    end
end
local seen = {}
for i = 1, #ARGV, 3 do
    if seen[ARGV[i]] then return ARGV[i] end
    seen[ARGV[i]] = true
end
for i = 1, #ARGV, 3 do
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
    redis.call('ZADD', KEYS[1], ARGV[i + 2], ARGV[i])
    redis.call('ZADD', KEYS[3], ARGV[i + 2], ARGV[i])
    redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 2])
end
return false
