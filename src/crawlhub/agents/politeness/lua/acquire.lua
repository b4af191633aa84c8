-- Grant slots (KEYS: slots, pace, adapt; ARGV: now, n, concurrency, delay, lease, token,
-- adaptive ('1' / '0'), start). Expired slots are freed first, in this same step. With
-- adaptive rules, the domain's learned limit and delay (the adapt hash) bound the grant.
-- Returns {ids joined by ',', wait, reason}. Key TTLs only collect idle domains; every
-- decision reads the scores.
local now = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local pace = redis.call('HMGET', KEYS[2], 'next', 'backoff')
local ready = math.max(tonumber(pace[1] or 0), tonumber(pace[2] or 0))
if ready > now then return {'', tostring(ready - now), 'pace'} end
local held = redis.call('ZCARD', KEYS[1])
local conc = tonumber(ARGV[3])
local delay = tonumber(ARGV[4])
if ARGV[7] == '1' then
  local a = redis.call('HMGET', KEYS[3], 'limit', 'delay')
  local limit = tonumber(a[1] or math.min(tonumber(ARGV[8]), conc))
  conc = math.max(1, math.min(conc, math.floor(limit)))
  delay = math.max(delay, tonumber(a[2] or 0))
end
if held >= conc then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {'', tostring(tonumber(first[2]) - now), 'full'}
end
local k = math.min(tonumber(ARGV[2]), conc - held)
if delay > 0 then
  k = 1
  redis.call('HSET', KEYS[2], 'next', tostring(now + delay))
  redis.call('EXPIRE', KEYS[2], math.ceil(delay) + 3600)
end
local lease = tonumber(ARGV[5])
local ids, z = {}, {}
for i = 0, k - 1 do
  local id = ARGV[6] .. ':' .. i
  ids[#ids + 1] = id
  z[#z + 1] = tostring(now + lease)
  z[#z + 1] = id
  if #z >= 1000 or i == k - 1 then  -- unpack() has a stack limit
    redis.call('ZADD', KEYS[1], unpack(z))
    z = {}
  end
end
redis.call('EXPIRE', KEYS[1], math.ceil(lease) + 60)
return {table.concat(ids, ','), '0', ''}
