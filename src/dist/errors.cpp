// MPI failures as qkv errors, and ending the whole job from one rank.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "qkv/dist.h"
#include "qkv/error.h"

namespace qkv::dist {

void check_mpi(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  fail(what, " failed: ", std::string(text, length));
}

void abort_job(MPI_Comm comm, const char* message, int code) {
  int rank = -1;
  MPI_Comm_rank(comm, &rank);
  std::fprintf(stderr, "qkv: rank %d: error: %s\n", rank, message);
  std::fflush(stderr);
  // MPI_Abort ends every rank of the job: none is left waiting for this one.
  MPI_Abort(comm, code);
  std::_Exit(code);  // not reached
}

}  // namespace qkv::dist
