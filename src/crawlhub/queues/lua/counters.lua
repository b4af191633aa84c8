-- ARGV: now, limit
local max = limit(ARGV[2])
requeue(now_ms(ARGV[1]), max)
local c = redis.call('HMGET', stats, 'total', 'success', 'failed', 'retried')
c[5] = redis.call('ZCARD', ready)
c[6] = redis.call('ZCARD', leased)
c[7] = redis.call('LLEN', dead)
c[8] = max
local kinds = redis.call('HMGET', stats, 'failed:max_attempts', 'failed:undeliverable',
                         'failed:nacked')
for i = 1, 3 do c[8 + i] = kinds[i] end
return c
