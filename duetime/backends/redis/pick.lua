-- The next stretch of the by-due index, and which of its messages a listing wants, decided on the
-- server: all of them, those for one destination (read from the start of each message), or those
-- of one group. A listing of one destination among hundreds, or of a large group, would
-- otherwise carry every other message to the client to be thrown away. A few hundred a call:
-- Redis does nothing else meanwhile.
-- The stretch starts at a score and skips the messages at that score already looked at (the
-- messages of one score are in id order), so a long walk costs each call its own stretch, not
-- the walk so far (an offset from the start is walked over again by every call).
-- KEYS: 1 by-due zset, 2 payload hash, 3 the group's member set (when picking by group)
-- ARGV: 1 lowest score, 2 highest (ZRANGEBYSCORE's forms), 3 how many at the lowest score to skip,
--       4 how many to look at, 5 'all', 'destination' or 'group', 6 the destination as the inside
--       of its JSON string (as the stored first line has it)
-- Returns {how many were looked at, the next call's lowest score and skip, then the ids picked,
-- in due order}.
local found = redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[1], ARGV[2], 'WITHSCORES', 'LIMIT', ARGV[3], ARGV[4])
local looked = #found / 2
if looked == 0 then
    return {0, ARGV[1], 0}
end
local last = found[#found]
local ties = 0
for i = #found, 2, -2 do
    if found[i] ~= last then break end
    ties = ties + 1
end
if ties == looked and last == ARGV[1] then
    ties = ties + tonumber(ARGV[3])  -- still at the score this call started from
end
local out = {looked, last, ties}
for i = 1, #found, 2 do
    local id = found[i]
    local wanted = true
    if ARGV[5] == 'group' then
        wanted = redis.call('SISMEMBER', KEYS[3], id) == 1
    elseif ARGV[5] == 'destination' then
        local payload = redis.call('HGET', KEYS[2], id)
        -- the first line is {"d":"<destination>","h":...}: an unescaped '","h":' ends the name
        wanted = payload and string.match(payload, '^{"d":"(.-)","h":') == ARGV[6]
    end
    if wanted then out[#out + 1] = id end
end
return out
