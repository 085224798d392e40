#!/usr/bin/env python3
"""Writes sim/docs/inc-vs-ring.svg: inc-sim's predicted 1 MiB AllReduce time (INC) and the
analytical ring AllReduce time vs host count, at 100 Gb/s and 1 us per link (numbers from
`inc-sim --topology T --size 1M --format csv --compare ring`, docs/SIMULATION.md), and
the same two at 200 Mb/s (`--link-rate 200mbit`) with the emulator's measured points
(scripts/demo --rate 200mbit through sim/validate-emulator.sh, quiet machine, --sync
--warmup 1: slowest rank's p50, median and range of 3 runs). The emulator cannot run
links at 100 Gb/s on this machine; at 200 Mb/s its links, not its CPU, set the pace
up to 9 hosts."""
import math

# hosts, topology, INC (us), ring (us)
POINTS = [
    (4, "topologies/1-4.yaml", 88.865, 137.829),
    (16, "gen --fanout 4 --hosts-per-leaf 4", 91.531, 277.286),
    (64, "gen --fanout 4 --hosts-per-leaf 16", 91.531, 669.151),
    (256, "gen --fanout 4,4 --hosts-per-leaf 16", 94.197, 3227.117),
    (1024, "gen --fanout 8,8 --hosts-per-leaf 16", 94.197, 12443.608),
    (4096, "gen --fanout 8,8,4 --hosts-per-leaf 16", 96.863, 65687.731),
    (8192, "gen --fanout 8,8,8 --hosts-per-leaf 16", 96.863, 131223.752),
]
# The same at 200 Mb/s: hosts, INC (us), ring (us)
POINTS_200M = [
    (4, 43675.920, 62938.560),
    (9, 44010.240, 74661.404),
    (16, 43675.920, 78763.200),
    (64, 44010.240, 83331.360),
    (256, 44010.240, 86618.400),
]
# Emulator, 1 MiB AllReduce at 200 Mb/s, lossless: hosts, median, min, max (us)
EMULATOR_200M = [
    (4, 47400.0, 47300.0, 49800.0),
    (9, 69600.0, 65300.0, 101900.0),
]
W, H, L, R, T, B = 640, 420, 70, 20, 40, 50
x0, x1 = math.log2(2), math.log2(16384)
y0, y1 = math.log10(50), math.log10(300000)


def x(h):
    return L + (math.log2(h) - x0) / (x1 - x0) * (W - L - R)


def y(us):
    return H - B - (math.log10(us) - y0) / (y1 - y0) * (H - T - B)


out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
       f'<rect width="{W}" height="{H}" fill="white"/>',
       f'<text x="{W/2}" y="20" text-anchor="middle" font-size="14">1 MiB AllReduce, 1 &#181;s per link: inc-sim (INC) vs analytical ring, and the emulator</text>']
for h in [4, 16, 64, 256, 1024, 4096, 16384]:
    out.append(f'<line x1="{x(h):.1f}" y1="{T}" x2="{x(h):.1f}" y2="{H-B}" stroke="#ddd"/>')
    out.append(f'<text x="{x(h):.1f}" y="{H-B+16}" text-anchor="middle">{h}</text>')
for us in [100, 1000, 10000, 100000]:
    out.append(f'<line x1="{L}" y1="{y(us):.1f}" x2="{W-R}" y2="{y(us):.1f}" stroke="#ddd"/>')
    out.append(f'<text x="{L-6}" y="{y(us)+4:.1f}" text-anchor="end">{us:,} &#181;s</text>')
out.append(f'<text x="{W/2}" y="{H-12}" text-anchor="middle">hosts</text>')
for col, idx, name in [("#1f77b4", 2, "INC at 100 Gb/s (inc-sim, real engines)"), ("#d62728", 3, "ring at 100 Gb/s: 2(n-1)/n&#183;S/B + 2(n-1)&#183;&#945;")]:
    pts = " ".join(f"{x(p[0]):.1f},{y(p[idx]):.1f}" for p in POINTS)
    out.append(f'<polyline points="{pts}" fill="none" stroke="{col}" stroke-width="2"/>')
    for p in POINTS:
        out.append(f'<circle cx="{x(p[0]):.1f}" cy="{y(p[idx]):.1f}" r="3.5" fill="{col}"/>')
    ly = T + 18 + (0 if idx == 2 else 18)
    out.append(f'<line x1="{L+14}" y1="{ly-4}" x2="{L+40}" y2="{ly-4}" stroke="{col}" stroke-width="2"/>')
    out.append(f'<text x="{L+46}" y="{ly}">{name}</text>')
for col, idx, name in [("#1f77b4", 1, "INC at 200 Mb/s (inc-sim)"), ("#d62728", 2, "ring at 200 Mb/s")]:
    pts = " ".join(f"{x(p[0]):.1f},{y(p[idx]):.1f}" for p in POINTS_200M)
    out.append(f'<polyline points="{pts}" fill="none" stroke="{col}" stroke-width="1.5" stroke-dasharray="6,4"/>')
    ly = T + 54 + (0 if idx == 1 else 18)
    out.append(f'<line x1="{L+14}" y1="{ly-4}" x2="{L+40}" y2="{ly-4}" stroke="{col}" stroke-width="1.5" stroke-dasharray="6,4"/>')
    out.append(f'<text x="{L+46}" y="{ly}">{name}</text>')
for h, med, lo, hi in EMULATOR_200M:
    cx, cy = x(h), y(med)
    out.append(f'<line x1="{cx:.1f}" y1="{y(lo):.1f}" x2="{cx:.1f}" y2="{y(hi):.1f}" stroke="black"/>')
    out.append(f'<path d="M{cx-5:.1f},{cy-5:.1f}L{cx+5:.1f},{cy+5:.1f}M{cx-5:.1f},{cy+5:.1f}L{cx+5:.1f},{cy-5:.1f}" stroke="black" stroke-width="2"/>')
ly = T + 90
out.append(f'<path d="M{L+22:.1f},{ly-9:.1f}L{L+32:.1f},{ly+1:.1f}M{L+22:.1f},{ly+1:.1f}L{L+32:.1f},{ly-9:.1f}" stroke="black" stroke-width="2"/>')
out.append(f'<text x="{L+46}" y="{ly}">emulator at 200 Mb/s (median, range of 3 runs)</text>')
out.append('</svg>')
open(__file__.replace("plot.py", "inc-vs-ring.svg"), "w").write("\n".join(out) + "\n")
