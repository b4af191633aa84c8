-- Shared head of every script: key names, the clock, lease checks and the expiry sweep.
-- Numbers handed to redis.call become strings with 14 significant digits, which is why
-- deadlines are integer milliseconds and scores are plain priorities. Batches travel as
-- a few framed string arguments, not one argument per message: packing thousands of
-- arguments costs the client more than the script costs the server.
local ready, leased, dead, payloads = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local priorities, attempts, stats, seq = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local reasons = KEYS[9]
local CHUNK = 1000  -- ids per multi-argument call, well below Lua's unpack() limit
local DEFAULT_MAX_ATTEMPTS = @DEFAULT_MAX_ATTEMPTS@

-- the caller's clock in integer milliseconds (crawlhub.core.clock: no TIME in scripts)
local function now_ms(given)
  return tonumber(given)
end

-- refs arrive as 'member:attempt,member:,...'; an empty attempt means any lease
local function refs(arg)
  return string.gmatch(arg, '(%d+):(%d*)')
end

-- leased now, and by the lease a receipt names when `want` is not ''
local function holds(id, want)
  if not redis.call('ZSCORE', leased, id) then return false end
  return want == '' or redis.call('HGET', attempts, id) == want
end

-- a message's priority: its entry in priorities, none for 0 (pushes write none for 0)
local function priority_of(id)
  return redis.call('HGET', priorities, id) or '0'
end

local function to_ready(id)
  redis.call('ZADD', ready, -tonumber(priority_of(id)), id)
end

-- the delivery limit in force; a configured one (given > 0) is stored for every process
local function limit(given)
  local n = tonumber(given)
  if n > 0 then
    redis.call('HSET', stats, 'max_attempts', n)
    return n
  end
  return tonumber(redis.call('HGET', stats, 'max_attempts') or DEFAULT_MAX_ATTEMPTS)
end

local function kill(id, reason, kind)
  redis.call('RPUSH', dead, id)
  redis.call('HSET', reasons, id, reason)
  redis.call('HINCRBY', stats, 'failed:' .. kind, 1)
end

local function spent(a)
  return 'delivered ' .. a .. ' times without ack'
end

-- expired leases back to ready, or to the dead letter once delivered `max` times
local function requeue(now, max)
  local expired = redis.call('ZRANGEBYSCORE', leased, '-inf', now)
  if #expired == 0 then return 0 end
  local back, died = 0, 0
  for _, id in ipairs(expired) do
    local a = tonumber(redis.call('HGET', attempts, id) or '0')
    if a >= max then
      kill(id, spent(a), 'max_attempts'); died = died + 1
    else
      to_ready(id); back = back + 1
    end
  end
  redis.call('ZREMRANGEBYSCORE', leased, '-inf', now)
  if back > 0 then redis.call('HINCRBY', stats, 'retried', back) end
  if died > 0 then redis.call('HINCRBY', stats, 'failed', died) end
  return #expired
end
