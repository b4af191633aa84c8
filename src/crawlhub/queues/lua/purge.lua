local k = redis.call('ZCARD', ready) + redis.call('ZCARD', leased) + redis.call('LLEN', dead)
redis.call('DEL', ready, leased, dead, payloads, priorities, attempts, stats, reasons)
return k
