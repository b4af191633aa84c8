-- Lease entries whose lease ended unsettled, then those whose deadline passed; purge
-- entries past their retention that nobody holds (KEYS: ledger, deadlines, retention,
-- leases, pending; ARGV: now, limit, lease end). Returns what each lease is for and the
-- raw entry, in pairs. A claimed entry stays in the ledger.
local out = {}
local due = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
for _, id in ipairs(due) do
  local raw = redis.call('HGET', KEYS[1], id)
  if raw then
    redis.call('ZADD', KEYS[4], ARGV[3], id)
    local pending = redis.call('HGET', KEYS[5], id) or 'timeout'
    table.insert(out, pending)
    table.insert(out, raw)
  else
    redis.call('ZREM', KEYS[4], id)
    redis.call('HDEL', KEYS[5], id)
  end
end
local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[2], id)
  local raw = redis.call('HGET', KEYS[1], id)
  if raw then
    redis.call('ZADD', KEYS[4], ARGV[3], id)
    redis.call('HSET', KEYS[5], id, 'timeout')
    table.insert(out, 'timeout')
    table.insert(out, raw)
  end
end
local old = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
for _, id in ipairs(old) do
  if not redis.call('ZSCORE', KEYS[4], id) then
    redis.call('HDEL', KEYS[1], id)
    redis.call('ZREM', KEYS[2], id)
  end
  redis.call('ZREM', KEYS[3], id)
end
return out
