-- KEYS: the job, the due set. ARGV: record, previous record ('' for a new job), ttl ms,
-- then (due ms, event) pairs. Returns 1, or 0 when the stored record is not `previous`.
local job, due = KEYS[1], KEYS[2]
if ARGV[2] ~= '' and redis.call('GET', job) ~= ARGV[2] then
  return 0
end
redis.call('SET', job, ARGV[1], 'PX', ARGV[3])
for i = 4, #ARGV, 2 do
  redis.call('ZADD', due, ARGV[i], ARGV[i + 1])
end
return 1
