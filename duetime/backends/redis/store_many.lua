-- Store messages all-or-nothing; a duplicate id stores nothing and returns that id.
-- KEYS: 1 ready zset, 2 payload hash, 3 by-due zset, 4 due-time hash, 5 group-of hash (the
--       members of group G are the set KEYS[5] .. ':' .. G), 6 failures hash
-- ARGV: id1, payload1, due1, group1 ('' for none), failures1, id2, payload2, due2, group2, ...
-- (a message moved here from another store keeps how often its delivery failed)
for i = 1, #ARGV, 5 do
    if redis.call('HEXISTS', KEYS[2], ARGV[i]) == 1 then
        return ARGV[i]
    end
end
local seen = {}
for i = 1, #ARGV, 5 do
    if seen[ARGV[i]] then return ARGV[i] end
    seen[ARGV[i]] = true
end
for i = 1, #ARGV, 5 do
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
    redis.call('ZADD', KEYS[1], ARGV[i + 2], ARGV[i])
    redis.call('ZADD', KEYS[3], ARGV[i + 2], ARGV[i])
    redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 2])
    if ARGV[i + 3] ~= '' then
        redis.call('HSET', KEYS[5], ARGV[i], ARGV[i + 3])
        redis.call('SADD', KEYS[5] .. ':' .. ARGV[i + 3], ARGV[i])
    end
    if ARGV[i + 4] ~= '0' then
        redis.call('HSET', KEYS[6], ARGV[i], ARGV[i + 4])
    end
end
return false
