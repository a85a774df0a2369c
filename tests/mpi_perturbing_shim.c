/* A fault for the replica check's test (tests/mpi_train_test.cpp): preloaded into one rank
 * (LD_PRELOAD), it adds 1e-3 to the first value of every float all-reduce result that rank
 * receives, as a corrupted transfer or a node with other arithmetic would leave it. The ranks'
 * parameters then drift apart while every option, input and start state agrees, which only the
 * trainer's periodic parameter check (--replica-check-every) can find. Built on MPI's profiling
 * interface: MPI_Iallreduce and MPI_Test are redefined here and call PMPI_Iallreduce and
 * PMPI_Test. Nothing of the toolkit links it. */
#include <mpi.h>

enum { kTracked = 64 };

static MPI_Request tracked_requests[kTracked];
static float* tracked_buffers[kTracked];

int MPI_Iallreduce(const void* send, void* receive, int count, MPI_Datatype type, MPI_Op op,
                   MPI_Comm comm, MPI_Request* request) {
  const int rc = PMPI_Iallreduce(send, receive, count, type, op, comm, request);
  if (rc != MPI_SUCCESS || type != MPI_FLOAT || count < 1) return rc;
  for (int i = 0; i < kTracked; ++i)
    if (tracked_buffers[i] == 0) {
      tracked_requests[i] = *request;
      tracked_buffers[i] = (float*)receive;
      break;
    }
  return rc;
}

int MPI_Test(MPI_Request* request, int* done, MPI_Status* status) {
  const MPI_Request before = *request; /* MPI_Test sets it to MPI_REQUEST_NULL when done */
  const int rc = PMPI_Test(request, done, status);
  if (rc != MPI_SUCCESS || !*done) return rc;
  for (int i = 0; i < kTracked; ++i)
    if (tracked_buffers[i] != 0 && tracked_requests[i] == before) {
      tracked_buffers[i][0] += 1e-3f;
      tracked_buffers[i] = 0;
      break;
    }
  return rc;
}
