if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[3]) then return 0 end
redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', ARGV[6])
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[2])
if redis.call('TTL', KEYS[3]) < tonumber(ARGV[3]) then redis.call('EXPIRE', KEYS[3], ARGV[3]) end
redis.pcall('PUBLISH', ARGV[4], ARGV[2] .. ' ' .. ARGV[5])
return 1
