-- Free slots, set backoffs and step adaptive domains (KEYS: the per-domain key stem, the
-- adaptive domains' sorted set; ARGV: now, then for each slot ten values: domain, slot,
-- backoff end ("" = none), latency ("" = none), overloaded ('1' / '0'; "" = no
-- feedback), target, start, tolerance, delay floor, max delay). A later backoff already
-- set is kept. The adaptive step is crawlhub.agents.politeness.adaptive.step, line for
-- line: change both together.
local now = tonumber(ARGV[1])
local LAT_W, ERR_W, DRIFT, OVER_CUT, SLOW_CUT, MIN_DELAY, DECAY = 0.3, 0.1, 0.002, 0.5, 0.8, 0.05, 0.9
local function num(v, d) if v then return tonumber(v) end return d end
for i = 2, #ARGV, 10 do
  local stem = KEYS[1] .. ARGV[i]
  redis.call('ZREM', stem .. ':slots', ARGV[i + 1])
  if ARGV[i + 2] ~= '' then
    local until_ = tonumber(ARGV[i + 2])
    local old = tonumber(redis.call('HGET', stem .. ':pace', 'backoff') or 0)
    if until_ > old then
      redis.call('HSET', stem .. ':pace', 'backoff', tostring(until_))
      redis.call('EXPIRE', stem .. ':pace', math.ceil(until_ - now) + 3600)
    end
  end
  if ARGV[i + 4] ~= '' then
    local target, start = tonumber(ARGV[i + 5]), tonumber(ARGV[i + 6])
    local tol, floor, maxd = tonumber(ARGV[i + 7]), tonumber(ARGV[i + 8]), tonumber(ARGV[i + 9])
    local over = ARGV[i + 4] == '1'
    local sample = tonumber(ARGV[i + 3])
    local f = redis.call('HMGET', stem .. ':adapt', 'limit', 'delay', 'latency', 'base',
                         'error_rate', 'cut', 'slow_start', 'ok', 'errors')
    local limit = num(f[1], math.min(start, target))
    local delay = num(f[2], floor)
    local lat, base, err = num(f[3], 0), num(f[4], 0), num(f[5], 0)
    local cut, ss, ok, errors = num(f[6], 0), num(f[7], 1), num(f[8], 0), num(f[9], 0)
    if sample then
      if lat <= 0 then lat = sample else lat = lat + LAT_W * (sample - lat) end
      if base <= 0 or lat < base then base = lat else base = base + DRIFT * (lat - base) end
    end
    local hit = 0
    if over then hit = 1 end
    err = err + ERR_W * (hit - err)
    local slow = base > 0 and lat > tol * base
    if ss == 1 and sample and base > 0 then
      if sample > tol * base then slow = true
      elseif sample > (1 + (tol - 1) / 2) * base then ss = 0 end  -- HyStart: stop doubling
    end
    if over or slow then
      if over then errors = errors + 1 else ok = ok + 1 end
      if now - cut >= math.max(lat, MIN_DELAY) then
        cut = now
        ss = 0
        if over then
          limit = math.max(1, limit * OVER_CUT)
          delay = math.min(maxd, math.max(2 * delay, lat / limit, MIN_DELAY, floor))
        else
          limit = math.max(1, limit * SLOW_CUT)
        end
      end
    else
      ok = ok + 1
      if ss == 1 then limit = math.min(target, limit + 1) else limit = math.min(target, limit + 1 / limit) end
      delay = floor + DECAY * (delay - floor)
      if delay - floor < 0.001 then delay = floor end
    end
    limit = math.min(limit, target)
    redis.call('HSET', stem .. ':adapt', 'limit', tostring(limit), 'delay', tostring(delay),
               'latency', tostring(lat), 'base', tostring(base), 'error_rate', tostring(err),
               'cut', tostring(cut), 'slow_start', tostring(ss), 'ok', tostring(ok),
               'errors', tostring(errors), 'updated', tostring(now))
    redis.call('EXPIRE', stem .. ':adapt', 30 * 86400)
    redis.call('ZADD', KEYS[2], now, ARGV[i])
  end
end
return 1
