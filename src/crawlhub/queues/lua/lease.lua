-- ARGV: now, visibility timeout ms, n, limit -> {deadline, id, priority, attempts, payload, ...}
local now = now_ms(ARGV[1])
local deadline = now + tonumber(ARGV[2])
requeue(now, limit(ARGV[4]))
local popped = redis.call('ZPOPMIN', ready, tonumber(ARGV[3]))
local out = {deadline}
for s = 1, #popped, 2 * CHUNK do
  local ids, z = {}, {}
  for i = s, math.min(s + 2 * CHUNK - 1, #popped), 2 do
    ids[#ids + 1] = popped[i]; z[#z + 1] = deadline; z[#z + 1] = popped[i]
  end
  redis.call('ZADD', leased, unpack(z))
  local pr = redis.call('HMGET', priorities, unpack(ids))
  local pl = redis.call('HMGET', payloads, unpack(ids))
  for j, id in ipairs(ids) do
    out[#out + 1] = id
    out[#out + 1] = pr[j] or '0'  -- (priority 0 is no entry)
    out[#out + 1] = redis.call('HINCRBY', attempts, id, 1)
    out[#out + 1] = pl[j]
  end
end
return out
