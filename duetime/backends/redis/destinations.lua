-- Messages per destination, read on the server from the start of each message's first line (its
-- body never leaves Redis, nor is it parsed): every message when there are at most ARGV[1], else
-- ARGV[2] picked at random. The caller asks many times for a larger sample: each call holds
-- Redis for one small batch only (it does nothing else meanwhile).
-- KEYS: 1 payload hash
-- Returns {1 when every message was read, else 0; then destination, count, ...}, each destination
-- as its JSON string's inside (escapes kept: the caller decodes it).
local all = redis.call('HLEN', KEYS[1]) <= tonumber(ARGV[1])
local payloads
if all then
    payloads = redis.call('HVALS', KEYS[1])
else
    local picked = redis.call('HRANDFIELD', KEYS[1], tonumber(ARGV[2]), 'WITHVALUES')
    payloads = {}
    for i = 2, #picked, 2 do payloads[#payloads + 1] = picked[i] end
end
local counts = {}
for _, payload in ipairs(payloads) do
    -- the first line is {"d":"<destination>","h":...}: an unescaped '","h":' ends the destination
    local destination = string.match(payload, '^{"d":"(.-)","h":')
    if destination then counts[destination] = (counts[destination] or 0) + 1 end
end
local out = {all and 1 or 0}
for destination, count in pairs(counts) do
    out[#out + 1] = destination
    out[#out + 1] = count
end
return out
