-- One of ARGV[1] delivery slots of an endpoint in one second (KEYS[1], the second's counter,
-- kept 2 s): 1 if taken, 0 if all are.
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('EXPIRE', KEYS[1], 2) end
if n > tonumber(ARGV[1]) then return 0 end
return 1
