-- include: put_message.lua
-- A chunk of a bulk job's rows for one endpoint, written once.
-- KEYS: 1-6 as store_many.lua; 7 the run's ledger hash; 8 the schedule job's set of the ids it
--       has stored (ids in it are skipped: stored by the job before, even if since delivered)
-- ARGV: 1 the chunk's field in the ledger ('' for none), 2 '1' to use the job's set, '2' to
--       use it and leave out of it the ids the store held (the caller replaces them), then id,
--       payload, due, group ('' for none), failures for each row
-- Returns the chunk's answer as JSON, [stored, [ids the store held already]]: the one the ledger
-- kept if the chunk was written before, else the new one (then kept). An id given twice: the
-- first is stored, the second is one the store held.
if ARGV[1] ~= '' then
    local done = redis.call('HGET', KEYS[7], ARGV[1])
    if done then return done end
end
local m = {KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]}
local stored, held = 0, {}
for i = 3, #ARGV, 5 do
    local id = ARGV[i]
    if ARGV[2] ~= '0' and redis.call('SADD', KEYS[8], id) == 0 then
        -- this job's before
    elseif redis.call('HEXISTS', KEYS[2], id) == 1 then
        held[#held + 1] = id
        if ARGV[2] == '2' then
            redis.call('SREM', KEYS[8], id)
        end
    else
        put_message(m, id, ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4])
        stored = stored + 1
    end
end
-- cjson writes an empty table as {}: the ids go as a list of their own
local answer = '[' .. stored .. ',' .. (#held == 0 and '[]' or cjson.encode(held)) .. ']'
if ARGV[1] ~= '' then
    redis.call('HSET', KEYS[7], ARGV[1], answer)
end
return answer
