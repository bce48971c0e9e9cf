/* Makes one system call fail with a chosen errno in every thread of the calling process,
 * from now on: a seccomp filter, so it works for raw syscall(2) calls that an LD_PRELOAD
 * interposer of libc wrappers never sees (kvtier's io_uring_enter, for example).
 *
 * The filter hands each matching call to a supervisor thread in this library (seccomp user
 * notification), which answers the first `times` calls with -err and lets later ones run
 * (SECCOMP_USER_NOTIF_FLAG_CONTINUE); times < 0 answers every call. The supervisor counts
 * what it saw, so a test can check the fault really fired. A filter cannot be removed: use
 * it in a child process.
 *
 * Loaded with ctypes (see seccomp_errno.py); needs Linux >= 5.7 (a listener together with
 * TSYNC). Build: cc -shared -fPIC -o seccomp_errno.so seccomp_errno.c -lpthread
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <stddef.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__)
#define NATIVE_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define NATIVE_ARCH AUDIT_ARCH_AARCH64
#else
#error "seccomp_errno.c: add this architecture's AUDIT_ARCH_* constant"
#endif

#ifndef SECCOMP_FILTER_FLAG_TSYNC_ESRCH
#define SECCOMP_FILTER_FLAG_TSYNC_ESRCH (1UL << 4)
#endif

static int g_listener = -1;
static int g_errno;
static long g_times;
static long g_calls;    /* matching calls the supervisor was asked about */
static long g_injected; /* of those, answered with -g_errno */

static void* supervise(void* unused) {
  (void)unused;
  struct seccomp_notif req;
  struct seccomp_notif_resp resp;
  for (;;) {
    memset(&req, 0, sizeof(req));
    if (ioctl(g_listener, SECCOMP_IOCTL_NOTIF_RECV, &req) != 0) {
      if (errno == EINTR || errno == ENOENT) continue; /* the caller went away meanwhile */
      return NULL;
    }
    memset(&resp, 0, sizeof(resp));
    resp.id = req.id;
    long n = __atomic_add_fetch(&g_calls, 1, __ATOMIC_SEQ_CST);
    if (g_times < 0 || n <= g_times) {
      resp.error = -g_errno;
      __atomic_add_fetch(&g_injected, 1, __ATOMIC_SEQ_CST);
    } else {
      resp.flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
    }
    /* ENOENT: the caller was interrupted by a signal and will restart the call. */
    (void)ioctl(g_listener, SECCOMP_IOCTL_NOTIF_SEND, &resp);
  }
}

/* Returns 0, or -errno when the filter cannot be installed (or one is installed already). */
int kvtier_fail_syscall(long nr, int err, long times) {
  if (g_listener >= 0) return -EBUSY;
  struct sock_filter insns[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, NATIVE_ARCH, 0, 3),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)nr, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_USER_NOTIF),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {(unsigned short)(sizeof(insns) / sizeof(insns[0])), insns};
  g_errno = err;
  g_times = times;
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -errno;
  /* TSYNC: the threads that exist already (kvtier's workers) get the filter too. */
  long fd = syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER,
                    SECCOMP_FILTER_FLAG_NEW_LISTENER | SECCOMP_FILTER_FLAG_TSYNC |
                        SECCOMP_FILTER_FLAG_TSYNC_ESRCH,
                    &prog);
  if (fd < 0) return -errno;
  g_listener = (int)fd;
  pthread_t thread;
  int e = pthread_create(&thread, NULL, supervise, NULL);
  if (e != 0) {
    close(g_listener); /* with no listener left, matching calls fail with ENOSYS */
    return -e;
  }
  pthread_detach(thread);
  return 0;
}

long kvtier_fail_syscall_calls(void) {
  return __atomic_load_n(&g_calls, __ATOMIC_SEQ_CST);
}

long kvtier_fail_syscall_injected(void) {
  return __atomic_load_n(&g_injected, __ATOMIC_SEQ_CST);
}
