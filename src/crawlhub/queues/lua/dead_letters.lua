local ids = redis.call('LRANGE', dead, 0, tonumber(ARGV[1]) - 1)
local out = {}
for _, id in ipairs(ids) do
  out[#out + 1] = id
  out[#out + 1] = priority_of(id)
  out[#out + 1] = redis.call('HGET', attempts, id)
  out[#out + 1] = redis.call('HGET', payloads, id)
  out[#out + 1] = redis.call('HGET', reasons, id) or ''
end
return out
