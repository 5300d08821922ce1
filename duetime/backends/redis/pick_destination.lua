-- A stretch of the by-due index, and which of its messages are for one destination, read on the
-- server from the start of each message (a listing of one destination among hundreds would
-- otherwise carry every other destination's bodies to the client to be thrown away).
-- KEYS: 1 by-due zset, 2 payload hash
-- ARGV: 1 lowest score, 2 highest (ZRANGEBYSCORE's forms), 3 offset, 4 how many to look at,
--       5 the destination as the inside of its JSON string (as the stored first line has it)
-- Returns {how many were looked at, then the ids for the destination, in due order}.
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[1], ARGV[2], 'LIMIT', ARGV[3], ARGV[4])
local out = {#ids}
for _, id in ipairs(ids) do
    local payload = redis.call('HGET', KEYS[2], id)
    -- the first line is {"d":"<destination>","h":...}: an unescaped '","h":' ends the destination
    if payload and string.match(payload, '^{"d":"(.-)","h":') == ARGV[5] then
        out[#out + 1] = id
    end
end
return out
