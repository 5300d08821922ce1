-- Keep a new recurring schedule unless its id is taken (duetime.backends._schedules): 1, or 0.
-- KEYS: 1 definitions hash, 2 versions hash, 3 planned-until zset, 4 ids zset (all scores 0: by id)
-- ARGV: schedule id, definition, planned until (µs, '' for none)
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then
    return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], 0)
if ARGV[3] ~= '' then
    redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
end
redis.call('ZADD', KEYS[4], 0, ARGV[1])
return 1
