-- push_rows(ready, payloads, priorities, stats, seq, blob, lens, prios): payloads
-- concatenated, their byte lengths 'l1,l2,..', their priorities 'p1,p2,..'; returns the
-- first id (push_list: the same from Lua lists). Also run by the hub's intake script
-- (hub/state/intake/redis.py) when its ledger shares the server, so a task's ledger entry
-- and its push are one atomic step.
-- push_list: the same with the payloads and priorities as Lua lists
local function push_list(ready, payloads, priorities, stats, seq, items, prios)
  local n = #items
  if n == 0 then return 0 end
  local first = redis.call('INCRBY', seq, n) - n + 1
  local z, p, q = {}, {}, {}
  for i = 1, n do
    local id = string.format('%016d', first + i - 1)
    local prio = prios[i]
    z[#z + 1] = prio == '0' and 0 or -tonumber(prio); z[#z + 1] = id
    p[#p + 1] = id; p[#p + 1] = items[i]
    if prio ~= '0' then  -- (priority 0 is no entry: priority_of)
      q[#q + 1] = id; q[#q + 1] = prio
    end
    if #p >= 2000 or i == n then
      redis.call('ZADD', ready, unpack(z))
      redis.call('HSET', payloads, unpack(p))
      if #q > 0 then redis.call('HSET', priorities, unpack(q)) end
      z, p, q = {}, {}, {}
    end
  end
  redis.call('HINCRBY', stats, 'total', n)
  return first
end

local function push_rows(ready, payloads, priorities, stats, seq, blob, lens_arg, prios_arg)
  local items, prios, pos = {}, {}, 1
  for x in string.gmatch(lens_arg, '%d+') do
    local stop = pos + tonumber(x)
    items[#items + 1] = string.sub(blob, pos, stop - 1)
    pos = stop
  end
  for x in string.gmatch(prios_arg, '[^,]+') do prios[#prios + 1] = x end
  return push_list(ready, payloads, priorities, stats, seq, items, prios)
end
