-- Append each due message to its queue, if the queue is declared: the transport's send_batch in
-- one call (the declared-queues check and the writes, where they were two round trips).
-- KEYS[1]: the set of declared queues; KEYS[1 + i]: message i's queue key (its stream or list).
-- ARGV[1]: 'stream' or 'list'; then four a message: its queue's name, id, headers (JSON), body
-- (a list's: the whole envelope, the id and headers unused).
-- Returns 1 a message appended, 0 a message whose queue is not declared (nothing written).
local stream = ARGV[1] == 'stream'
local out = {}
for i = 2, #KEYS do
  local a = 2 + (i - 2) * 4
  if redis.call('SISMEMBER', KEYS[1], ARGV[a]) == 1 then
    if stream then
      redis.call('XADD', KEYS[i], '*', 'id', ARGV[a + 1], 'headers', ARGV[a + 2], 'body', ARGV[a + 3])
    else
      redis.call('LPUSH', KEYS[i], ARGV[a + 3])
    end
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
