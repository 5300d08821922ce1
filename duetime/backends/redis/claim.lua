-- Claim up to ARGV[2] messages claimable at ARGV[1] (microseconds): re-score each to its lease
-- expiry ARGV[3] and record the claim, atomically. A crashed dispatcher's claims become
-- claimable again by themselves, because their score is the lease expiry.
-- Returns {claimed, soonest}: each claimed message as {id, payload, failures, due}, and for a batch
-- shorter than ARGV[2] the lowest score left once claimed (the next due time; '' when nothing is
-- stored), or false (not read) for a full batch.
-- KEYS: 1 ready zset, 2 payload hash, 3 claims hash, 4 failures hash, 5 due-time hash
local limit = tonumber(ARGV[2])
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, limit)
local out = {}
for _, id in ipairs(ids) do
    redis.call('ZADD', KEYS[1], 'XX', ARGV[3], id)
    redis.call('HSET', KEYS[3], id, ARGV[3])
    out[#out + 1] = {id, redis.call('HGET', KEYS[2], id), redis.call('HGET', KEYS[4], id) or '0', redis.call('HGET', KEYS[5], id)}
end
local soonest = false
if #ids < limit then
    local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    soonest = first[2] or ''
end
return {out, soonest}
