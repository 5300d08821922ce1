-- Forget a recurring schedule (duetime.backends._schedules): 1, or 0 when there was none.
-- KEYS: 1 definitions hash, 2 versions hash, 3 planned-until zset, 4 ids zset. ARGV: schedule id
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
return redis.call('HDEL', KEYS[2], ARGV[1])
