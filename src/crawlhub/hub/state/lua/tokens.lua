-- Token bucket shared by every hub process (KEYS: bucket hash; ARGV: rate, n, burst, the
-- caller's now: crawlhub.core.clock, hosts keep their clocks in sync).
local now = tonumber(ARGV[4])
local rate = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local tokens = tonumber(redis.call('HGET', KEYS[1], 'tokens') or burst)
local stamp = tonumber(redis.call('HGET', KEYS[1], 'stamp') or now)
tokens = math.min(burst, tokens + math.max(0, now - stamp) * rate)
local wait = 0
if tokens >= n then tokens = tokens - n else wait = (n - tokens) / rate end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'stamp', tostring(now))
redis.call('EXPIRE', KEYS[1], 3600)
return tostring(wait)
