local p = ARGV[1]
if redis.call('HEXISTS', p .. ':wh:notices', ARGV[2]) == 0 then return 0 end
redis.call('HSET', p .. ':wh:notices', ARGV[2], ARGV[3])
redis.call('ZADD', p .. ':wh:notices:due', ARGV[4], ARGV[2])
return 1
