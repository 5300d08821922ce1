-- A stretch of the by-due index, and which of its messages a listing wants, decided on the server:
-- those for one destination (read from the start of each message), or those of one group (a
-- listing of one destination among hundreds, or of a large group, would otherwise carry every
-- other message to the client to be thrown away).
-- KEYS: 1 by-due zset, 2 payload hash, 3 the group's member set (when picking by group)
-- ARGV: 1 lowest score, 2 highest (ZRANGEBYSCORE's forms), 3 offset, 4 how many to look at,
--       5 'destination' or 'group', 6 the destination as the inside of its JSON string (as the
--       stored first line has it)
-- Returns {how many were looked at, then the ids picked, in due order}.
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[1], ARGV[2], 'LIMIT', ARGV[3], ARGV[4])
local out = {#ids}
local by_group = ARGV[5] == 'group'
for _, id in ipairs(ids) do
    local wanted
    if by_group then
        wanted = redis.call('SISMEMBER', KEYS[3], id) == 1
    else
        local payload = redis.call('HGET', KEYS[2], id)
        -- the first line is {"d":"<destination>","h":...}: an unescaped '","h":' ends the name
        wanted = payload and string.match(payload, '^{"d":"(.-)","h":') == ARGV[6]
    end
    if wanted then out[#out + 1] = id end
end
return out
