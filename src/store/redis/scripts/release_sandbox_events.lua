-- KEYS: the due set, the event log. ARGV: now ms, max, the log's MINID, created (unix s).
-- Each due member is [id, type, workspace, environment, data JSON]; moved to the log once.
local due, log = KEYS[1], KEYS[2]
local types = {}
for _, member in ipairs(redis.call('ZRANGEBYSCORE', due, '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])) do
  redis.call('ZREM', due, member)
  local ok, e = pcall(cjson.decode, member)
  if ok and type(e) == 'table' and #e == 5 then
    redis.call('XADD', log, 'MINID', '~', ARGV[3], '*', 'id', e[1], 'type', e[2],
      'created', ARGV[4], 'workspace', e[3], 'environment', e[4], 'data', e[5])
    types[#types + 1] = e[2]
  end
end
return types
