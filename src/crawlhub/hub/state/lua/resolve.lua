-- Remove one entry and return it (KEYS: ledger, deadlines, retention; ARGV: uuid).
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if raw then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
end
return raw
