-- include: put_message.lua
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
local m = {KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]}
for i = 1, #ARGV, 5 do
    put_message(m, ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4])
end
return false
