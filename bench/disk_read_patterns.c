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
// (Reads in flight per thread: use fio --ioengine=libaio|io_uring --iodepth=N.)
// Prints GB/s of payload read. Build: cc -O2 -pthread -o disk_read_patterns disk_read_patterns.c
// Usage: disk_read_patterns DIR [options]; run it several times, alternating variants: the
// disk and the CPUs are shared.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static const char* dir;
static size_t size = 2u << 20, chunk = 0;
static int files = 128, threads = 4, header = 0, split = 0, thp = 0, share = 0;
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
  int slots = 1;
  struct slot* s = calloc((size_t)slots, sizeof(*s));
  char* hdr = buffer(4096 * (size_t)slots);
  for (int k = 0; k < slots; ++k) s[k].buf = buffer(size);
  char path[4096];
  {
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
  }
  return NULL;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s DIR [--files N] [--size B] [--threads N] [--header] [--split] "
                    "[--mem 4k|thp] [--chunk B] [--share] [--write-only|--read-only]\n",
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
  if (!read_only) write_files();
  if (write_only) return 0;
  pthread_t t[1024];
  double t0 = now();
  for (int i = 0; i < threads; ++i) pthread_create(&t[i], NULL, reader, (void*)(intptr_t)i);
  for (int i = 0; i < threads; ++i) pthread_join(t[i], NULL);
  double s = now() - t0;
  printf("%.3f GB/s  (%d files x %zu B, %d threads, header %d split %d mem %s chunk %zu)\n",
         (double)files * (double)size / s / 1e9, files, size, threads, header, split,
         thp ? "thp" : "4k", chunk);
  return 0;
}
