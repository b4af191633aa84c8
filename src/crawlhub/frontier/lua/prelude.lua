local function parse(member)
  local seq, prio, seg, key = string.match(member, '^(%d+)|(%-?%d+)|(%-?%d+)|(.*)$')
  return seq, tonumber(prio), seg, key
end

local function member_of(stem, seg, key)
  local v = redis.call('HGET', stem .. seg .. ':seeds', key)
  if not v then return nil end
  local seq, prio = string.match(v, '^(%d+)|(%-?%d+)|')
  return string.format('%016d|%s|%s|%s', tonumber(seq), prio, seg, key), tonumber(prio)
end

local function count(stem, seg, field, n)
  redis.call('HINCRBY', stem .. seg .. ':stats', field, n)
end

-- waiting seeds whose time came and expired leases go to ready (bounded per call)
local function sweep(stem, ready, due, leased, now)
  local moved = 0
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', due, '-inf', now, 'LIMIT', 0, 1000)) do
    local _, prio = parse(m)
    redis.call('ZREM', due, m)
    redis.call('ZADD', ready, -prio, m)
    moved = moved + 1
  end
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', leased, '-inf', now, 'LIMIT', 0, 1000)) do
    local _, prio, seg = parse(m)
    redis.call('ZREM', leased, m)
    redis.call('ZADD', ready, -prio, m)
    count(stem, seg, 'leased', -1)
    count(stem, seg, 'pending', 1)
    moved = moved + 1
  end
  return moved
end
