-- ARGV: '1' for the dead letter else '0', refs, reason, limit, kind (of a dead letter)
local dead_letter = ARGV[1] == '1'
local reason = ARGV[3]
local max = 0
if not dead_letter then max = limit(ARGV[4]) end
local back, died = 0, 0
for id, want in refs(ARGV[2]) do
  if holds(id, want) then
    redis.call('ZREM', leased, id)
    if dead_letter then
      kill(id, reason, ARGV[5]); died = died + 1
    else
      local a = tonumber(redis.call('HGET', attempts, id))
      if a >= max then
        local why = spent(a)
        if reason ~= '' then why = why .. '; last nack: ' .. reason end
        kill(id, why, 'max_attempts'); died = died + 1
      else
        to_ready(id); back = back + 1
      end
    end
  end
end
if back > 0 then redis.call('HINCRBY', stats, 'retried', back) end
if died > 0 then redis.call('HINCRBY', stats, 'failed', died) end
return back + died
