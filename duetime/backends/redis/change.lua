-- Remove, release, count a failure, cancel or reschedule messages: each id of ARGV[4..] in turn,
-- in one call (a dispatcher's batch settles in one round trip, not one a message). A claims-hash
-- time below zero is a flow-control hold (store.py, _HOLD), no claim: a cancel reaches it.
-- KEYS: 1 ready zset, 2 payload hash, 3 claims hash, 4 failures hash, 5 due-time hash, 6 by-due zset,
--       7 group-of hash (the members of group G are the set KEYS[7] .. ':' .. G)
-- ARGV: 1 action, 2 now (us), 3 new due (us, reschedule and fail_until), 4.. ids
-- Returns per id: 1 done, 0 no such message, -1 in flight (cancel/reschedule of a claimed message).
local action, now = ARGV[1], tonumber(ARGV[2])

local function act(id)
    if redis.call('HEXISTS', KEYS[2], id) == 0 then return 0 end
    local claim = tonumber(redis.call('HGET', KEYS[3], id) or '0')
    if (action == 'cancel' or action == 'reschedule') and claim > now then return -1 end
    if action == 'remove' or action == 'cancel' then
        redis.call('ZREM', KEYS[1], id)
        redis.call('ZREM', KEYS[6], id)
        redis.call('HDEL', KEYS[2], id)
        redis.call('HDEL', KEYS[3], id)
        redis.call('HDEL', KEYS[4], id)
        redis.call('HDEL', KEYS[5], id)
        local group = redis.call('HGET', KEYS[7], id)
        if group then
            redis.call('HDEL', KEYS[7], id)
            redis.call('SREM', KEYS[7] .. ':' .. group, id)
        end
        return 1
    end
    if action == 'fail' or action == 'fail_until' then redis.call('HINCRBY', KEYS[4], id, 1) end
    if action == 'reschedule' or action == 'fail_until' then
        redis.call('HSET', KEYS[5], id, ARGV[3])
        redis.call('ZADD', KEYS[6], ARGV[3], id)
    end
    redis.call('ZADD', KEYS[1], redis.call('HGET', KEYS[5], id), id)
    redis.call('HDEL', KEYS[3], id)
    return 1
end

local out = {}
for i = 4, #ARGV do
    out[#out + 1] = act(ARGV[i])
end
return out
