#include "cluster/placement.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

const char *dt_place_strategy_name(dt_place_strategy s) {
    return s == DT_PLACE_ROUND_ROBIN ? "round_robin" : "greedy";
}

int dt_place_strategy_parse(const char *name, dt_place_strategy *out, dt_error *err) {
    if (strcmp(name, "greedy") == 0) *out = DT_PLACE_GREEDY;
    else if (strcmp(name, "round_robin") == 0) *out = DT_PLACE_ROUND_ROBIN;
    else
        return dt_errorf(err, DT_EINVAL, "--placement: unknown strategy \"%.64s\" (greedy or round_robin)",
                         name);
    return 0;
}

void dt_placement_free(dt_placement *p) {
    if (!p) return;
    free(p->views);
    free(p->slices);
    free(p->shard_count);
    free(p->ps_begin);
    free(p->ps_slices);
    memset(p, 0, sizeof *p);
}

static int push_slice(dt_placement *p, int *cap, int view, int ps, size_t offset, size_t count,
                      dt_error *err) {
    if (p->n_slices == *cap) {
        int new_cap = *cap ? *cap * 2 : 16;
        dt_slice *s = realloc(p->slices, (size_t)new_cap * sizeof *s);
        if (!s) return dt_errorf(err, DT_ENOMEM, "out of memory for the placement's slices");
        p->slices = s;
        *cap = new_cap;
    }
    p->slices[p->n_slices++] = (dt_slice){.view = view, .ps = ps, .offset = offset, .count = count};
    p->shard_count[ps] += count; /* the load so far */
    return 0;
}

static int place(dt_placement *p, dt_error *err) {
    int cap = 0, rc = 0, k = p->n_ps;
    size_t *load = p->shard_count;
    for (int v = 0; v < p->n_views && !rc; v++) {
        const dt_param_view *view = &p->views[v];
        if (view->count == 0) continue;
        if (p->strategy == DT_PLACE_ROUND_ROBIN) {
            rc = push_slice(p, &cap, v, v % k, view->offset, view->count, err);
        } else if (view->count <= p->share) {
            int best = 0;
            for (int i = 1; i < k; i++)
                if (load[i] < load[best]) best = i; /* strict: the first minimum wins */
            rc = push_slice(p, &cap, v, best, view->offset, view->count, err);
        } else {
            /* Fill ps tasks in index order up to the share. The room left is always enough:
             * sum(share - load) >= k*share - placed >= total - placed >= this variable. */
            size_t done = 0;
            for (int i = 0; i < k && done < view->count && !rc; i++) {
                size_t room = load[i] < p->share ? p->share - load[i] : 0;
                size_t take = view->count - done < room ? view->count - done : room;
                if (take) rc = push_slice(p, &cap, v, i, view->offset + done, take, err);
                done += take;
            }
            if (!rc && done < view->count)
                return dt_errorf(err, DT_EINVAL, "placement: %s: no room left (internal error)",
                                 view->name);
        }
    }
    return rc;
}

int dt_placement_compute(dt_placement *p, const dt_param_view *views, int n_views, int n_ps,
                         dt_place_strategy strategy, dt_error *err) {
    memset(p, 0, sizeof *p);
    if (n_ps < 1) return dt_errorf(err, DT_EINVAL, "placement: %d ps tasks (need at least 1)", n_ps);
    if (n_views < 0) return dt_errorf(err, DT_EINVAL, "placement: %d variables", n_views);
    if (strategy != DT_PLACE_GREEDY && strategy != DT_PLACE_ROUND_ROBIN)
        return dt_errorf(err, DT_EINVAL, "placement: unknown strategy %d", (int)strategy);
    size_t end = 0, total = 0;
    for (int i = 0; i < n_views; i++) {
        const dt_param_view *v = &views[i];
        if (v->offset < end)
            return dt_errorf(err, DT_EINVAL,
                             "placement: variable %d (%.48s) at offset %zu overlaps the one before "
                             "(ends at %zu); views must be in ascending order",
                             i, v->name, v->offset, end);
        if (v->offset > SIZE_MAX / 4 || v->count > SIZE_MAX / 4 - v->offset)
            return dt_errorf(err, DT_EINVAL, "placement: variable %d (%.48s) is too large", i,
                             v->name);
        end = v->offset + v->count;
        total += v->count;
    }
    p->strategy = strategy;
    p->n_ps = n_ps;
    p->n_views = n_views;
    p->total = total;
    p->share = total / (size_t)n_ps + (total % (size_t)n_ps != 0);
    int rc = 0;
    p->views = dt_calloc(n_views ? (size_t)n_views : 1, sizeof *p->views, "placement views", err);
    p->shard_count = dt_calloc((size_t)n_ps, sizeof *p->shard_count, "placement totals", err);
    p->ps_begin = dt_calloc((size_t)n_ps + 1, sizeof *p->ps_begin, "placement index", err);
    if (!p->views || !p->shard_count || !p->ps_begin) rc = DT_ENOMEM;
    if (!rc) {
        if (n_views) memcpy(p->views, views, (size_t)n_views * sizeof *views);
        rc = place(p, err);
    }
    if (!rc) {
        p->ps_slices = dt_calloc(p->n_slices ? (size_t)p->n_slices : 1, sizeof *p->ps_slices,
                                 "placement index", err);
        if (!p->ps_slices) rc = DT_ENOMEM;
    }
    if (rc) {
        dt_placement_free(p);
        return rc;
    }
    /* Group slice indices by ps (counting sort keeps flat order within a ps) and lay out shards. */
    for (int s = 0; s < p->n_slices; s++) p->ps_begin[p->slices[s].ps + 1]++;
    for (int i = 0; i < n_ps; i++) p->ps_begin[i + 1] += p->ps_begin[i];
    int *fill = dt_calloc((size_t)n_ps, sizeof *fill, "placement index", err);
    if (!fill) {
        dt_placement_free(p);
        return DT_ENOMEM;
    }
    memset(p->shard_count, 0, (size_t)n_ps * sizeof *p->shard_count);
    for (int s = 0; s < p->n_slices; s++) {
        dt_slice *sl = &p->slices[s];
        p->ps_slices[p->ps_begin[sl->ps] + fill[sl->ps]++] = s;
        sl->shard_offset = p->shard_count[sl->ps];
        p->shard_count[sl->ps] += sl->count;
    }
    free(fill);
    return 0;
}

int dt_placement_locate(const dt_placement *p, size_t flat_offset, int *ps, size_t *shard_offset) {
    int lo = 0, hi = p->n_slices; /* slices are sorted by offset and do not overlap */
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        const dt_slice *s = &p->slices[mid];
        if (flat_offset < s->offset) hi = mid;
        else if (flat_offset >= s->offset + s->count) lo = mid + 1;
        else {
            *ps = s->ps;
            *shard_offset = s->shard_offset + (flat_offset - s->offset);
            return mid;
        }
    }
    return -1;
}

/* Copies the floats of ps's shard [off, off + len) between the shard and the flat buffer. */
static void copy_range(const dt_placement *p, int ps, size_t off, size_t len, float *shard, float *flat, int to_shard) {
    size_t end = off + len;
    for (int j = p->ps_begin[ps]; j < p->ps_begin[ps + 1]; j++) {
        const dt_slice *s = &p->slices[p->ps_slices[j]];
        size_t a = s->shard_offset > off ? s->shard_offset : off;
        size_t b = s->shard_offset + s->count < end ? s->shard_offset + s->count : end;
        if (a >= b) continue;
        float *sh = shard + a, *fl = flat + s->offset + (a - s->shard_offset);
        if (to_shard) memcpy(sh, fl, (b - a) * sizeof(float));
        else memcpy(fl, sh, (b - a) * sizeof(float));
    }
}

void dt_placement_gather_range(const dt_placement *p, int ps, size_t off, size_t len, float *shard, const float *flat) {
    copy_range(p, ps, off, len, shard, (float *)flat, 1);
}

void dt_placement_scatter_range(const dt_placement *p, int ps, size_t off, size_t len, float *flat, const float *shard) {
    copy_range(p, ps, off, len, (float *)shard, flat, 0);
}

void dt_placement_gather(const dt_placement *p, int ps, float *shard, const float *flat) {
    dt_placement_gather_range(p, ps, 0, p->shard_count[ps], shard, flat);
}

void dt_placement_scatter(const dt_placement *p, int ps, float *flat, const float *shard) {
    dt_placement_scatter_range(p, ps, 0, p->shard_count[ps], flat, shard);
}

double dt_placement_imbalance(const dt_placement *p) {
    if (p->total == 0 || p->n_ps < 1) return 1.0;
    size_t max = 0;
    for (int i = 0; i < p->n_ps; i++)
        if (p->shard_count[i] > max) max = p->shard_count[i];
    return (double)max * p->n_ps / (double)p->total;
}

static uint64_t fnv(uint64_t h, uint64_t v) {
    for (int i = 0; i < 8; i++) {
        h ^= (v >> (8 * i)) & 0xff;
        h *= 0x100000001b3ULL;
    }
    return h;
}

uint64_t dt_placement_fingerprint(const dt_placement *p) {
    uint64_t h = 0xcbf29ce484222325ULL;
    h = fnv(h, (uint64_t)p->n_ps);
    h = fnv(h, (uint64_t)p->strategy);
    h = fnv(h, (uint64_t)p->n_slices);
    for (int s = 0; s < p->n_slices; s++) {
        const dt_slice *sl = &p->slices[s];
        h = fnv(h, (uint64_t)sl->view);
        h = fnv(h, (uint64_t)sl->ps);
        h = fnv(h, sl->offset);
        h = fnv(h, sl->count);
    }
    return h;
}

void dt_placement_print(const dt_placement *p, FILE *f) {
    double mb = 4.0 / 1e6;
    fprintf(f, "placement: %s over %d ps task%s, %d variables, %zu floats (%.2f MB), even share %zu floats\n",
            dt_place_strategy_name(p->strategy), p->n_ps, p->n_ps == 1 ? "" : "s", p->n_views,
            p->total, (double)p->total * mb, p->share);
    double even = p->total ? (double)p->total / p->n_ps : 1.0;
    for (int i = 0; i < p->n_ps; i++)
        fprintf(f, "  ps %d: %zu floats (%.2f MB, %.3f of even), %d slice%s\n", i, p->shard_count[i],
                (double)p->shard_count[i] * mb, (double)p->shard_count[i] / even,
                p->ps_begin[i + 1] - p->ps_begin[i], p->ps_begin[i + 1] - p->ps_begin[i] == 1 ? "" : "s");
    fprintf(f, "  imbalance (max / even): %.3f\n", dt_placement_imbalance(p));
    fprintf(f, "  %-24s %10s           ps N [shard offset +floats] ...\n", "variable", "size");
    int s = 0;
    for (int v = 0; v < p->n_views; v++) {
        fprintf(f, "  %-24.48s %10zu floats ->", p->views[v].name, p->views[v].count);
        if (s >= p->n_slices || p->slices[s].view != v) fprintf(f, " (empty)");
        for (; s < p->n_slices && p->slices[s].view == v; s++)
            fprintf(f, " ps %d [%zu +%zu]", p->slices[s].ps, p->slices[s].shard_offset,
                    p->slices[s].count);
        fputc('\n', f);
    }
}

int dt_placement_compute_dense(dt_placement *p, const dt_net *net, int n_ps, dt_place_strategy strategy,
                               dt_error *err) {
    memset(p, 0, sizeof *p);
    int n = dt_net_num_views(net);
    if (!dt_net_compact_tables(net)) return dt_placement_compute(p, dt_net_view(net, 0), n, n_ps, strategy, err);
    dt_param_view *v = dt_calloc(n ? (size_t)n : 1, sizeof *v, "placement views", err);
    if (!v) return DT_ENOMEM;
    for (int i = 0; i < n; i++) {
        v[i] = *dt_net_view(net, i);
        if (v[i].table) v[i].count = 0; /* no slice: its rows are on every ps by row placement */
    }
    int rc = dt_placement_compute(p, v, n, n_ps, strategy, err);
    free(v);
    for (int i = 0; !rc && i < n_ps; i++)
        if (!p->shard_count[i])
            rc = dt_errorf(err, DT_EINVAL, "ps_hosts: ps %d would hold none of the model's dense variables (%zu "
                           "floats over %d ps tasks; its embedding tables are sparse tables, spread over every ps): "
                           "a ps without dense variables is not supported yet, use fewer ps tasks", i, p->total, n_ps);
    if (rc) dt_placement_free(p);
    return rc;
}
