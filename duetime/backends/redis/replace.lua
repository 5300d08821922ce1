-- include: put_message.lua
-- Put a waiting message's content in place of the stored one (duetime.interfaces.IfExists), in one
-- call: only if the id is stored and no claim holds it, not even one that lapsed (its dispatcher
-- may still be sending, and would remove the new content when it is done). A flow-control hold
-- (a negative time in the claims hash) is no claim: the replace ends it.
-- KEYS: 1 ready zset, 2 payload hash, 3 by-due zset, 4 due-time hash, 5 group-of hash (the members
--       of group G are the set KEYS[5] .. ':' .. G), 6 failures hash, 7 claims hash
-- ARGV: 1 id, 2 payload, 3 due (us), 4 group ('' for none), 5 failures
-- Returns 1 replaced, 0 no such message, -1 held by a claim.
local id = ARGV[1]
if redis.call('HEXISTS', KEYS[2], id) == 0 then return 0 end
local claim = redis.call('HGET', KEYS[7], id)
if claim and tonumber(claim) >= 0 then return -1 end
if claim then redis.call('HDEL', KEYS[7], id) end
local group = redis.call('HGET', KEYS[5], id)
if group then
    redis.call('HDEL', KEYS[5], id)
    redis.call('SREM', KEYS[5] .. ':' .. group, id)
end
redis.call('HDEL', KEYS[6], id)
put_message({KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]}, id, ARGV[2], ARGV[3], ARGV[4], ARGV[5])
return 1
