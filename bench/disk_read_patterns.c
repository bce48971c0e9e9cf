// Block-file read patterns on a real disk, one variable at a time (issue #23).
//
// Writes --files block files of --size bytes (+ a 4 KiB header page with --header) under
// DIR, then reads them all back with --threads threads, each thread taking whole files from
// a shared counter (or a contiguous share of them with --share), every file opened with
// O_DIRECT, read, closed, as kvtier's and vLLM's tiers do. What can be varied:
//   --header        files hold a 4 KiB header page before the payload (kvtier's format)
//   --split         with --header: read the header page, then the payload (two preads)
//                   instead of one preadv of header page + payload
//   --mem 4k|thp    the payload buffers: 4 KiB pages (MADV_NOHUGEPAGE; physically scattered,
//                   like an engine's anonymous or pinned memory) or transparent huge pages
//                   (MADV_HUGEPAGE; physically contiguous in 2 MiB pieces)
//   --chunk BYTES   read the payload in pieces of BYTES (default: all at once)
//   --depth N       io_uring with N reads in flight per thread (0: psync preadv)
// Prints GB/s of payload read. Build: cc -O2 -pthread -o disk_read_patterns disk_read_patterns.c
// Usage: disk_read_patterns DIR [options]; run it several times, alternating variants: the
// disk and the CPUs are shared.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/io_uring.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static const char* dir;
static size_t size = 2u << 20, chunk = 0;
static int files = 128, threads = 4, header = 0, split = 0, thp = 0, depth = 0, share = 0;
static int write_only = 0, read_only = 0;
static atomic_int next_file;

static void die(const char* what) {
  perror(what);
  exit(1);
}

static void* buffer(size_t bytes) {
  size_t len = (bytes + (2u << 20) - 1) & ~((size_t)(2u << 20) - 1);
  char* p = mmap(NULL, len + (2u << 20), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                 -1, 0);
  if (p == MAP_FAILED) die("mmap");
  char* a = (char*)(((uintptr_t)p + (2u << 20) - 1) & ~((uintptr_t)(2u << 20) - 1));
  if (madvise(a, len, thp ? MADV_HUGEPAGE : MADV_NOHUGEPAGE) != 0) die("madvise");
  memset(a, 1, len);
  return a;
}

static void path_of(int i, char* out) { snprintf(out, 4096, "%s/f%05d", dir, i); }

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void write_files(void) {
  void* buf = buffer(size + 4096);
  for (int i = 0; i < files; ++i) {
    char path[4096];
    path_of(i, path);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0600);
    if (fd < 0) die("open for write");
    size_t len = size + (header ? 4096 : 0);
    if (pwrite(fd, buf, len, 0) != (ssize_t)len) die("pwrite");
    close(fd);
  }
}

// ---- io_uring, the bare minimum (no liburing) ---------------------------------------------
struct ring {
  int fd;
  unsigned *sq_head, *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
  struct io_uring_sqe* sqes;
  struct io_uring_cqe* cqes;
};

static void ring_init(struct ring* r, unsigned entries) {
  struct io_uring_params p;
  memset(&p, 0, sizeof(p));
  r->fd = (int)syscall(__NR_io_uring_setup, entries, &p);
  if (r->fd < 0) die("io_uring_setup");
  size_t sq_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
  size_t cq_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
  char* sq = mmap(0, sq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd,
                  IORING_OFF_SQ_RING);
  char* cq = mmap(0, cq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd,
                  IORING_OFF_CQ_RING);
  r->sqes = mmap(0, p.sq_entries * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_SQES);
  if (sq == MAP_FAILED || cq == MAP_FAILED || r->sqes == MAP_FAILED) die("mmap ring");
  r->sq_head = (unsigned*)(sq + p.sq_off.head);
  r->sq_tail = (unsigned*)(sq + p.sq_off.tail);
  r->sq_mask = (unsigned*)(sq + p.sq_off.ring_mask);
  r->sq_array = (unsigned*)(sq + p.sq_off.array);
  r->cq_head = (unsigned*)(cq + p.cq_off.head);
  r->cq_tail = (unsigned*)(cq + p.cq_off.tail);
  r->cq_mask = (unsigned*)(cq + p.cq_off.ring_mask);
  r->cqes = (struct io_uring_cqe*)(cq + p.cq_off.cqes);
}

static void ring_readv(struct ring* r, int fd, struct iovec* iov, int n, off_t off, __u64 tag) {
  unsigned tail = *r->sq_tail, idx = tail & *r->sq_mask;
  struct io_uring_sqe* sqe = &r->sqes[idx];
  memset(sqe, 0, sizeof(*sqe));
  sqe->opcode = IORING_OP_READV;
  sqe->fd = fd;
  sqe->addr = (__u64)(uintptr_t)iov;
  sqe->len = (unsigned)n;
  sqe->off = (__u64)off;
  sqe->user_data = tag;
  r->sq_array[idx] = idx;
  __atomic_store_n(r->sq_tail, tail + 1, __ATOMIC_RELEASE);
}

static int ring_wait_one(struct ring* r, int to_submit, __u64* tag) {
  for (;;) {
    unsigned head = *r->cq_head;
    if (head != __atomic_load_n(r->cq_tail, __ATOMIC_ACQUIRE)) {
      struct io_uring_cqe* cqe = &r->cqes[head & *r->cq_mask];
      *tag = cqe->user_data;
      int res = cqe->res;
      __atomic_store_n(r->cq_head, head + 1, __ATOMIC_RELEASE);
      return res;
    }
    if (syscall(__NR_io_uring_enter, r->fd, to_submit, 1, IORING_ENTER_GETEVENTS, NULL, 0) < 0 &&
        errno != EINTR)
      die("io_uring_enter");
    to_submit = 0;
  }
}

// ---- readers ------------------------------------------------------------------------------
struct slot {
  int fd;
  char* buf;  // header page (if any) then payload
  struct iovec iov[64];
  int niov;
};

static int layout(struct slot* s, char* hdr) {
  int n = 0;
  if (header && !split) s->iov[n++] = (struct iovec){hdr, 4096};
  size_t step = chunk ? chunk : size;
  for (size_t done = 0; done < size && n < 64; done += step)
    s->iov[n++] = (struct iovec){s->buf + done, size - done < step ? size - done : step};
  return n;
}

static int take(int id, int* mine) {
  if (!share) return atomic_fetch_add(&next_file, 1);
  int per = files / threads, i = id * per + (*mine)++;
  return *mine <= per ? i : files;
}

static void* reader(void* arg) {
  int id = (int)(intptr_t)arg, mine = 0;
  int slots = depth > 0 ? depth : 1;
  struct slot* s = calloc((size_t)slots, sizeof(*s));
  char* hdr = buffer(4096 * (size_t)slots);
  for (int k = 0; k < slots; ++k) s[k].buf = buffer(size);
  char path[4096];
  if (depth == 0) {
    for (int i; (i = take(id, &mine)) < files;) {
      path_of(i, path);
      int fd = open(path, O_RDONLY | O_DIRECT);
      if (fd < 0) die("open");
      struct stat st;
      fstat(fd, &st);
      off_t off = 0;
      if (header && split) {
        if (pread(fd, hdr, 4096, 0) != 4096) die("pread header");
        off = 4096;
      }
      int n = layout(&s[0], hdr);
      if (chunk) {
        for (int k = 0; k < n; ++k) {
          ssize_t got = preadv(fd, &s[0].iov[k], 1, off);
          if (got != (ssize_t)s[0].iov[k].iov_len) die("preadv chunk");
          off += got;
        }
      } else if (preadv(fd, s[0].iov, n, off) <= 0) {
        die("preadv");
      }
      close(fd);
    }
  } else {
    struct ring r;
    ring_init(&r, (unsigned)slots * 2);
    int inflight = 0, free_slot[256], nfree = slots, done = 0;
    for (int k = 0; k < slots; ++k) free_slot[k] = k;
    while (!done || inflight > 0) {
      int queued = 0;
      while (!done && nfree > 0) {
        int i = take(id, &mine);
        if (i >= files) {
          done = 1;
          break;
        }
        struct slot* sl = &s[free_slot[--nfree]];
        path_of(i, path);
        sl->fd = open(path, O_RDONLY | O_DIRECT);
        if (sl->fd < 0) die("open");
        off_t off = 0;
        char* h = hdr + 4096 * (size_t)(sl - s);
        if (header && split) {
          if (pread(sl->fd, h, 4096, 0) != 4096) die("pread header");
          off = 4096;
        }
        sl->niov = layout(sl, h);
        ring_readv(&r, sl->fd, sl->iov, sl->niov, off, (__u64)(sl - s));
        ++queued;
        ++inflight;
      }
      if (inflight == 0) break;
      __u64 tag;
      int res = ring_wait_one(&r, queued, &tag);
      if (res <= 0) {
        errno = -res;
        die("ring read");
      }
      close(s[tag].fd);
      free_slot[nfree++] = (int)tag;
      --inflight;
    }
  }
  return NULL;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s DIR [--files N] [--size B] [--threads N] [--header] [--split] "
                    "[--mem 4k|thp] [--chunk B] [--depth N] [--share] [--write-only|--read-only]\n",
            argv[0]);
    return 2;
  }
  dir = argv[1];
  for (int i = 2; i < argc; ++i) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : "";
    if (!strcmp(a, "--files")) files = atoi(v), ++i;
    else if (!strcmp(a, "--size")) size = strtoull(v, 0, 0), ++i;
    else if (!strcmp(a, "--threads")) threads = atoi(v), ++i;
    else if (!strcmp(a, "--chunk")) chunk = strtoull(v, 0, 0), ++i;
    else if (!strcmp(a, "--depth")) depth = atoi(v), ++i;
    else if (!strcmp(a, "--mem")) thp = !strcmp(v, "thp"), ++i;
    else if (!strcmp(a, "--header")) header = 1;
    else if (!strcmp(a, "--split")) split = 1;
    else if (!strcmp(a, "--share")) share = 1;
    else if (!strcmp(a, "--write-only")) write_only = 1;
    else if (!strcmp(a, "--read-only")) read_only = 1;
    else {
      fprintf(stderr, "unknown option %s\n", a);
      return 2;
    }
  }
  if (depth > 256) depth = 256;
  if (!read_only) write_files();
  if (write_only) return 0;
  pthread_t t[1024];
  double t0 = now();
  for (int i = 0; i < threads; ++i) pthread_create(&t[i], NULL, reader, (void*)(intptr_t)i);
  for (int i = 0; i < threads; ++i) pthread_join(t[i], NULL);
  double s = now() - t0;
  printf("%.3f GB/s  (%d files x %zu B, %d threads, header %d split %d mem %s chunk %zu depth %d)\n",
         (double)files * (double)size / s / 1e9, files, size, threads, header, split,
         thp ? "thp" : "4k", chunk, depth);
  return 0;
}
