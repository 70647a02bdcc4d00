add_executable(ecstore-server ${CMAKE_CURRENT_LIST_DIR}/server_main.c)
target_link_libraries(ecstore-server PRIVATE ecstore_static)
install(TARGETS ecstore-server RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
