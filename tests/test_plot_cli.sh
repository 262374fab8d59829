#!/usr/bin/env bash
# dtrain plot from real runs' event files: two short runs (one resumed, so it has two event files per
# split), drawn into one SVG that is parsed back: the legend names the runs, every line has as many
# points as the event files hold distinct steps of its tag (counted through dtrain inspect), the
# points lie inside their panel in step order; a truncated event file is read up to its damage;
# bad input gives one line.
. "$(dirname "$0")/lib.sh"
py=/usr/bin/python3

fashion_subset "$tmp/fs" 384 64
printf 'model tiny28\ninput 28 28 1\nconv2d filters=4 kernel=3 stride=2\nrelu\nflatten\ndense units=10\n' >"$tmp/tiny28.model"
run() { # run DIR LR STEPS
  "$bin" train --model "$tmp/tiny28.model" --data "$tmp/fs" --logdir "$1/ck" --summary_dir "$1/summary_log" \
    --batch_size 16 --learning_rate "$2" --train_steps "$3" --steps_to_validate 3 --threads 2 >>"$tmp/train.log" 2>&1
}
run "$tmp/runs/a" 0.005 9 && sleep 1.1 && run "$tmp/runs/a" 0.005 15 && run "$tmp/runs/b" 0.001 12 \
  || { bad "training runs"; tail "$tmp/train.log"; }
check "run a was resumed: two event files per split" test "$(ls "$tmp/runs/a/summary_log/train" | wc -l)" -eq 2

# verify SVG RUN=NAME...: parse the picture; for each run, its lines' point counts against the event
# files' distinct steps per (split, tag) as dtrain inspect lists them.
verify() {
  local svg=$1; shift
  local spec=() a
  for a in "$@"; do
    local dir=${a%%=*} name=${a#*=} f
    for split in train test; do
      for f in "$dir/$split"/*tfevents*; do "$bin" inspect "$f" 2>/dev/null | sed "s|^|$split |"; done >"$tmp/inspect.$split"
    done
    cp "$tmp/inspect.train" "$tmp/inspect.train.${#spec[@]}"; cp "$tmp/inspect.test" "$tmp/inspect.test.${#spec[@]}"
    spec+=("$name" "$tmp/inspect.train.${#spec[@]}" "$tmp/inspect.test.${#spec[@]}")
  done
  "$py" - "$svg" "${spec[@]}" <<'PY'
import re, sys, xml.etree.ElementTree as ET
svg, rest = sys.argv[1], sys.argv[2:]
ns = {"s": "http://www.w3.org/2000/svg"}
root = ET.parse(svg).getroot()
names = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text") if t.get("class") == "run-name"]
want = [rest[i] for i in range(0, len(rest), 3)]
assert names == want, f"legend names {names}, expected {want}"
lines = [p for p in root.iter("{http://www.w3.org/2000/svg}polyline") if p.get("class") == "series"]
assert len(lines) == 4 * len(want), f"{len(lines)} lines for {len(want)} runs"
rects = {g.get("data-tag"): g.find("s:rect", ns) for g in root.iter("{http://www.w3.org/2000/svg}g") if g.get("class") == "panel"}
total = 0
for i in range(0, len(rest), 3):
    name, files = rest[i], {"train": rest[i + 1], "validation": rest[i + 2]}
    for split, path in files.items():
        for tag in ("cost", "accuracy"):
            steps = set()
            for l in open(path):
                m = re.match(r"\S+ \d+\s+\S+\s+(\d+)\s+" + tag + r" = ", l)
                if m: steps.add(int(m.group(1)))
            line = [p for p in lines if p.get("data-run") == name and p.get("data-split") == split and p.get("data-tag") == tag]
            assert len(line) == 1, f"{name} {split} {tag}: {len(line)} lines"
            pts = [tuple(map(float, xy.split(","))) for xy in line[0].get("points").split()]
            assert int(line[0].get("data-points")) == len(pts) == len(steps) > 0, \
                f"{name} {split} {tag}: {line[0].get('data-points')} / {len(pts)} points, event files have {len(steps)} steps"
            r = rects[tag]
            x0, y0, w, h = (float(r.get(k)) for k in ("x", "y", "width", "height"))
            assert all(x0 - 0.01 <= x <= x0 + w + 0.01 and y0 - 0.01 <= y <= y0 + h + 0.01 for x, y in pts), f"{name} {split} {tag}: a point outside its panel"
            assert all(a[0] < b[0] for a, b in zip(pts, pts[1:])), f"{name} {split} {tag}: points not in step order"
            total += len(pts)
print(f"{len(want)} runs, {total} points")
PY
}

if "$bin" plot --out "$tmp/p.svg" "$tmp/runs/a/summary_log" "$tmp/runs/b/summary_log/" 2>"$tmp/err"; then
  check "two runs: names, points ($(verify "$tmp/p.svg" "$tmp/runs/a/summary_log=$tmp/runs/a" "$tmp/runs/b/summary_log=$tmp/runs/b" 2>&1 | tail -1))" \
    verify "$tmp/p.svg" "$tmp/runs/a/summary_log=$tmp/runs/a" "$tmp/runs/b/summary_log=$tmp/runs/b"
  check "plot says what it wrote" grep -q "wrote .*p.svg (2 runs, [0-9]* points)" "$tmp/err"
  "$py" - "$tmp/p.svg" "$tmp/runs/a" <<'PY' && ok "resumed run: 5 training points (3, 6, 9, 12, 15), each step once" || bad "resumed run: 5 training points"
import sys, xml.etree.ElementTree as ET
l = [p for p in ET.parse(sys.argv[1]).getroot().iter("{http://www.w3.org/2000/svg}polyline")
     if p.get("data-run") == sys.argv[2] and p.get("data-split") == "train" and p.get("data-tag") == "cost"]
sys.exit(0 if l and l[0].get("data-points") == "5" else 1)
PY
else bad "plot two runs: $(cat "$tmp/err")"; fi

# Names given, with characters XML must escape; the check can fail (a wrong name is caught).
"$bin" plot --out "$tmp/n.svg" --title 'a <b> & "c"' "fast & <new>=$tmp/runs/a/summary_log" 2>/dev/null
check "NAME=DIR, escaped" verify "$tmp/n.svg" "$tmp/runs/a/summary_log=fast & <new>"
if verify "$tmp/n.svg" "$tmp/runs/a/summary_log=other" >/dev/null 2>&1; then bad "a wrong name is caught"; else ok "a wrong name is caught"; fi

# A truncated event file (a writer killed mid-record): the records before the damage are drawn.
cp -r "$tmp/runs/b" "$tmp/runs/cut"
f=$(ls "$tmp/runs/cut/summary_log/test"/*tfevents*)
truncate -s -3 "$f"
if "$bin" plot --out "$tmp/cut.svg" "$tmp/runs/cut/summary_log" 2>"$tmp/err"; then
  check "truncated file: a warning" grep -q "warning: .*tfevents.*the records before it are used" "$tmp/err"
  check "truncated file: the good records drawn" verify "$tmp/cut.svg" "$tmp/runs/cut/summary_log=$tmp/runs/cut"
else bad "truncated file: $(cat "$tmp/err")"; fi

mkdir -p "$tmp/empty"
expect_error "missing folder" 1 "nope: no event files" "$bin" plot --out "$tmp/x.svg" "$tmp/nope"
expect_error "folder without event files" 1 "empty: no event files" "$bin" plot --out "$tmp/x.svg" "$tmp/empty"
expect_error "no run" 1 "no run given" "$bin" plot --out "$tmp/x.svg"
expect_error "not SVG" 1 "writes SVG" "$bin" plot --out "$tmp/x.png" "$tmp/runs/a/summary_log"
check "nothing written on errors" test ! -e "$tmp/x.svg"

summary
