-- pin_meta: write the cluster metadata if the store has none, else compare.
-- KEYS[1] meta
-- ARGV[1] our metadata, JSON
-- Reply: {'ok'} | {'meta', stored_json}
local m = check_meta(KEYS[1], ARGV[1])
if m then
  return m
end
return {'ok'}
