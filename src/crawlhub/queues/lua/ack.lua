-- ARGV: refs
local k = 0
for id, want in refs(ARGV[1]) do
  if holds(id, want) then
    redis.call('ZREM', leased, id)
    redis.call('HDEL', payloads, id)
    redis.call('HDEL', priorities, id)
    redis.call('HDEL', attempts, id)
    k = k + 1
  end
end
if k > 0 then redis.call('HINCRBY', stats, 'success', k) end
return k
