-- Cancel every message of a group that no live claim holds; returns how many.
-- KEYS: 1 ready zset, 2 payload hash, 3 claims hash, 4 failures hash, 5 due-time hash, 6 by-due zset,
--       7 group-of hash
-- ARGV: 1 group, 2 now (us)
local members_key = KEYS[7] .. ':' .. ARGV[1]
local now = tonumber(ARGV[2])
local cancelled = 0
for _, id in ipairs(redis.call('SMEMBERS', members_key)) do
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
return cancelled
