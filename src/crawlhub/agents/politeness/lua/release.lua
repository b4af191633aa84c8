-- Free slots and set backoffs (KEYS: the per-domain key stem; ARGV: now, then domain /
-- slot / backoff end ("" = none) triples). A later backoff already set is kept.
local now = tonumber(ARGV[1])
for i = 2, #ARGV, 3 do
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
end
return 1
