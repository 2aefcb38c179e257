if redis.call('EXISTS', KEYS[1]) == 1 or redis.call('EXISTS', KEYS[2]) == 1 then return -1 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2])
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[3])
local e = redis.call('INCR', KEYS[4])
redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[6], e .. '-0', 'h', ARGV[2], 'm', ARGV[7])
redis.pcall('PUBLISH', ARGV[5], e)
return e
