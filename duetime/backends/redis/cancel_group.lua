-- Cancel the messages of a group that no live claim holds, at most ARGV[3] of them (0: all);
-- returns how many. The group's set is read a step at a time (SSCAN), so a batch of a large
-- group holds Redis for that batch only.
-- KEYS: 1 ready zset, 2 payload hash, 3 claims hash, 4 failures hash, 5 due-time hash, 6 by-due zset,
--       7 group-of hash
-- ARGV: 1 group, 2 now (us), 3 at most this many (0: all)
local members_key = KEYS[7] .. ':' .. ARGV[1]
local now = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local cancelled = 0
local cursor = '0'
repeat
    local step = redis.call('SSCAN', members_key, cursor, 'COUNT', 1000)
    cursor = step[1]
    for _, id in ipairs(step[2]) do
        if limit > 0 and cancelled >= limit then
            return cancelled
        end
        if redis.call('HEXISTS', KEYS[2], id) == 0 then
            redis.call('SREM', members_key, id)  -- gone already (a crash between deletes)
        elseif tonumber(redis.call('HGET', KEYS[3], id) or '0') <= now then
            redis.call('ZREM', KEYS[1], id)
            redis.call('ZREM', KEYS[6], id)
            for k = 2, 5 do redis.call('HDEL', KEYS[k], id) end
            redis.call('HDEL', KEYS[7], id)
            redis.call('SREM', members_key, id)
            cancelled = cancelled + 1
        end
    end
until cursor == '0'
return cancelled
