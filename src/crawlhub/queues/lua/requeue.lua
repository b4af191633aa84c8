-- ARGV: now, limit
return requeue(now_ms(ARGV[1]), limit(ARGV[2]))
