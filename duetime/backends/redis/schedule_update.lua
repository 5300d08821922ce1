-- include: put_message.lua
-- Compare-and-set a recurring schedule and store its new ticks, all or nothing
-- (duetime.backends._schedules). Returns 1, or 0 when the row is gone or its version moved on.
-- KEYS: 1 definitions hash, 2 versions hash, 3 planned-until zset, then the message keys as
--       store_many.lua has them: 4 ready zset, 5 payload hash, 6 by-due zset, 7 due-time hash,
--       8 group-of hash (the members of group G are the set KEYS[8] .. ':' .. G), 9 failures hash
-- ARGV: schedule id, version read, definition, planned until (µs, '' for none), then per tick:
--       id, payload, due, group ('' for none), failures
local version = redis.call('HGET', KEYS[2], ARGV[1])
if not version or version ~= ARGV[2] then
    return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
if ARGV[4] == '' then
    redis.call('ZREM', KEYS[3], ARGV[1])
else
    redis.call('ZADD', KEYS[3], ARGV[4], ARGV[1])
end
local m = {KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]}
for i = 5, #ARGV, 5 do
    if redis.call('HEXISTS', KEYS[5], ARGV[i]) == 0 then
        put_message(m, ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4])
    end
end
return 1
