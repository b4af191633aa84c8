-- Every message of a stream, then the stream gone (group and pending list with it).
local all = redis.call('XRANGE', KEYS[1], '-', '+')
redis.call('DEL', KEYS[1])
return all
