-- wrk script: GET or POST torchyard's (or the bare app's) job route, ids taken in turn from a file,
-- and one JSON line of the figures at the end (parsed by bench/wrk_load.py).
local ids = {}
local ids_file = os.getenv("WRK_IDS")
if ids_file then
  for line in io.lines(ids_file) do ids[#ids + 1] = line end
end
local token = os.getenv("WRK_TOKEN") or ""
local method = os.getenv("WRK_METHOD") or "GET"
local path = os.getenv("WRK_PATH") or "/"
local body = nil
local body_file = os.getenv("WRK_BODY")
if body_file then
  local f = io.open(body_file, "r")
  body = f:read("*a")
  f:close()
end
local i = 0

request = function()
  i = i + 1
  local target = path
  if #ids > 0 then target = string.format(path, ids[(i % #ids) + 1]) end
  local headers = {["Authorization"] = "Bearer " .. token}
  if body then headers["Content-Type"] = "application/json" end
  return wrk.format(method, target, headers, body)
end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,"non2xx":%d,"socket_errors":%d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99), e.status,
    e.connect + e.read + e.write + e.timeout))
end
