-- KEYS: ledger unpushed gates owners alive   ARGV: now dead_before owner limit. Claims
-- records whose owner has not beaten since dead_before; returns entry, '1' if its gate
-- is inherited else '0', for each.
local ledger, unpushed, gates, owners, alive = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local now, dead_before, owner, limit = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
redis.call('ZADD', alive, now, owner)
redis.call('ZREMRANGEBYSCORE', alive, '-inf', dead_before - 3600)
local out = {}
for _, id in ipairs(redis.call('ZRANGE', unpushed, 0, -1)) do
  if #out >= 2 * limit then break end
  local was = redis.call('HGET', owners, id)
  local beat = was and redis.call('ZSCORE', alive, was)
  if not beat or tonumber(beat) < dead_before then
    local raw = redis.call('HGET', ledger, id)
    if raw then
      redis.call('ZADD', unpushed, now, id)
      redis.call('HSET', owners, id, owner)
      local ok, entry = pcall(cjson.decode, raw)
      local inherited = '0'
      if ok and type(entry) == 'table' and type(entry['g']) == 'string'
          and redis.call('HGET', gates, entry['g']) == '+' .. id then
        inherited = '1'
      end
      out[#out + 1] = raw
      out[#out + 1] = inherited
    else
      redis.call('ZREM', unpushed, id)
      redis.call('HDEL', owners, id)
    end
  end
end
return out
