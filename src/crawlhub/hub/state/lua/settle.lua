-- Settle one entry if it is still exactly what the caller read (KEYS: ledger, deadlines,
-- retention, leases, pending, counters, unpushed; ARGV: uuid, expected entry, next entry
-- ("" = remove), its deadline ("" = none), what its lease is for ("" = no lease: it waits
-- for its result), lease end, retention expiry, then counter field / increment pairs).
-- Settled means pushed: the intake has no push of it left to redo.
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
local id = ARGV[1]
redis.call('ZREM', KEYS[7], id)
if ARGV[3] == '' then
  redis.call('HDEL', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
  redis.call('ZREM', KEYS[3], id)
  redis.call('ZREM', KEYS[4], id)
  redis.call('HDEL', KEYS[5], id)
else
  redis.call('HSET', KEYS[1], id, ARGV[3])
  redis.call('ZADD', KEYS[3], ARGV[7], id)
  if ARGV[5] == '' then
    redis.call('ZREM', KEYS[4], id)
    redis.call('HDEL', KEYS[5], id)
    if ARGV[4] == '' then
      redis.call('ZREM', KEYS[2], id)
    else
      redis.call('ZADD', KEYS[2], ARGV[4], id)
    end
  else
    redis.call('ZREM', KEYS[2], id)
    redis.call('ZADD', KEYS[4], ARGV[6], id)
    redis.call('HSET', KEYS[5], id, ARGV[5])
  end
end
for i = 8, #ARGV, 2 do redis.call('HINCRBY', KEYS[6], ARGV[i], ARGV[i + 1]) end
return 1
