if redis.call('EXISTS', KEYS[1]) == 1 then return 'filled' end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return 'taken' end
return 'busy'
