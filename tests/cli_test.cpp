#include <gtest/gtest.h>
TEST(Cli, Todo) {}
