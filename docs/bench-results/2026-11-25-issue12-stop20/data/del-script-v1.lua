local n, me = 0, 'h:' .. ARGV[1]
for _, k in ipairs(KEYS) do
  local had = redis.pcall('HDEL', k, me)
  if type(had) == 'number' then
    local other = false
    for _, f in ipairs(redis.call('HKEYS', k)) do
      if string.sub(f, 1, 2) == 'h:' then
        other = true
        break
      end
    end
    if not other and (had == 1 or redis.call('HGET', k, 'node') == ARGV[1]) then
      n = n + redis.call('DEL', k)
    end
  end
end
return n
