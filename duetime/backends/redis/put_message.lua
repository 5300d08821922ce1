-- How the Redis store keeps one message: written once here, included by the scripts that store
-- messages (store_many.lua, schedule_update.lua).
-- m: the message keys in this order: 1 ready zset, 2 payload hash, 3 by-due zset, 4 due-time hash,
--    5 group-of hash (the members of group G are the set m[5] .. ':' .. G), 6 failures hash
local function put_message(m, id, payload, due, group, failures)
    redis.call('HSET', m[2], id, payload)
    redis.call('ZADD', m[1], due, id)
    redis.call('ZADD', m[3], due, id)
    redis.call('HSET', m[4], id, due)
    if group ~= '' then
        redis.call('HSET', m[5], id, group)
        redis.call('SADD', m[5] .. ':' .. group, id)
    end
    if failures ~= '0' then
        redis.call('HSET', m[6], id, failures)
    end
end
