-- Forget agents last seen at or before ARGV[1], then return every registration, every
-- heartbeat and every last-seen time (KEYS: info, beat, seen).
return {redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[2]),
        redis.call('ZRANGE', KEYS[3], 0, -1, 'WITHSCORES')}
