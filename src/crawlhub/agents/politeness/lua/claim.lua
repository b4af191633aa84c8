-- Claim the robots.txt fetch of one origin (KEYS: its hash; ARGV: now, claim end).
local now = tonumber(ARGV[1])
local e = redis.call('HMGET', KEYS[1], 'status', 'expires', 'claim')
if e[1] and tonumber(e[2]) > now then return 0 end
if e[3] and tonumber(e[3]) > now then return 0 end
redis.call('HSET', KEYS[1], 'claim', ARGV[2])
if not e[1] then redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2]) - now) + 60) end
return 1
