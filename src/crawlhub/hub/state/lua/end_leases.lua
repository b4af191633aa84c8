-- Every lease ends now (KEYS: leases; ARGV: now): the next claim takes the entries over.
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[1], '+inf')
for _, id in ipairs(ids) do
  redis.call('ZADD', KEYS[1], ARGV[1], id)
end
return #ids
